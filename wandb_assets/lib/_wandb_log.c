/* The native half of wandb_assets.lib.offline_runs: one pass over a .wandb file's bytes that frames its records
 * and folds every history item and summary update to its key's last value, so a 10,000-step log (~30,000
 * records, ~220,000 items) costs a few milliseconds instead of a Python loop per chunk and per item.
 *
 * It does exactly what the pure-Python reader in offline_runs.py does (read_frames, then one parse, then _fold);
 * tests/test_offline_runs.py checks the two agree on every test log and on hundreds of damaged copies.
 *
 * scan(data: bytes, start: int) -> (
 *     records,        number of record payloads framed (unparsable ones included)
 *     unparsable,     payloads with history/summary fields whose wire format or UTF-8 is invalid (dropped)
 *     history_items,  history items in the parsable records
 *     history,        {key id: last value_json (bytes)}, in first-seen order
 *     summary,        {key id: last value_json (bytes)} over summary updates, in first-seen order
 *     removed,        {key id: None} over summary removes
 *     others,         [payload bytes] of every other record (run, config, exit, ...), for protobuf to parse
 *     damage,         [(code, offset, a, b)] framing damage in file order (offline_runs.FRAMING_DAMAGE)
 * )
 * A key id is b"K" + key (a key, or a nested key of one part: W&B treats them alike) or b"N" + each part as a
 * 4-byte little-endian length and its bytes (two or more parts, or none).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define BLOCK 32768
#define HEADER_SIZE 7
enum { FULL = 1, FIRST = 2, MIDDLE = 3, LAST = 4 };
/* Framing damage codes: the texts live in offline_runs.FRAMING_DAMAGE, shared with the Python reader. */
enum { D_IMPOSSIBLE = 1, D_CUT = 2, D_CRC = 3, D_ORPHAN = 4, D_CUT_SPLIT = 5, D_STRAY = 6 };

/* ---- CRC-32 (IEEE, as zlib.crc32), slicing by 8 ---- */
static uint32_t crc_table[8][256];

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++) crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xff];
}

static uint32_t crc32_ieee(const uint8_t *p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    while (n >= 8) {
        uint32_t a, b;
        memcpy(&a, p, 4);
        memcpy(&b, p + 4, 4);
        a ^= c;
        c = crc_table[7][a & 0xff] ^ crc_table[6][(a >> 8) & 0xff] ^ crc_table[5][(a >> 16) & 0xff] ^
            crc_table[4][a >> 24] ^ crc_table[3][b & 0xff] ^ crc_table[2][(b >> 8) & 0xff] ^
            crc_table[1][(b >> 16) & 0xff] ^ crc_table[0][b >> 24];
        p += 8;
        n -= 8;
    }
#endif
    while (n--) c = crc_table[0][(c ^ *p++) & 0xff] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

/* ---- UTF-8 validation (protobuf rejects a proto3 string that is not UTF-8; so do we) ---- */
static inline int utf8_valid(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        while (i + 8 <= n) { /* ASCII fast path */
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (w & 0x8080808080808080ull) break;
            i += 8;
        }
        while (i < n && s[i] < 0x80) i++;
        if (i >= n) break;
        uint8_t c = s[i];
        if (c < 0x80) { i++; continue; }
        size_t len;
        uint32_t cp;
        if (c >= 0xC2 && c <= 0xDF) { len = 2; cp = c & 0x1F; }
        else if (c >= 0xE0 && c <= 0xEF) { len = 3; cp = c & 0x0F; }
        else if (c >= 0xF0 && c <= 0xF4) { len = 4; cp = c & 0x07; }
        else return 0;
        if (i + len > n) return 0;
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return 0;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if ((len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
            return 0;
        i += len;
    }
    return 1;
}

/* ---- protobuf wire format ---- */
static inline int read_varint(const uint8_t **pp, const uint8_t *end, uint64_t *out) {
    const uint8_t *p = *pp;
    if (p < end && *p < 0x80) { /* most tags and lengths are one byte */
        *out = *p;
        *pp = p + 1;
        return 1;
    }
    uint64_t v = 0;
    for (int shift = 0; shift < 70; shift += 7) {
        if (p >= end) return 0;
        uint8_t b = *p++;
        v |= (uint64_t)(b & 0x7F) << shift;
        if (!(b & 0x80)) {
            *pp = p;
            *out = v;
            return 1;
        }
    }
    return 0;
}

/* One field: its number, wire type and, for length-delimited fields, the bytes. 0 on malformed input. */
typedef struct {
    uint64_t number;
    int wire;
    const uint8_t *data;
    size_t len;
} Field;

static inline int next_field(const uint8_t **pp, const uint8_t *end, Field *f) {
    uint64_t tag, v;
    if (!read_varint(pp, end, &tag)) return 0;
    f->number = tag >> 3;
    f->wire = (int)(tag & 7);
    if (f->number == 0 || f->number > 536870911u) return 0;
    switch (f->wire) {
    case 0:
        return read_varint(pp, end, &v);
    case 1:
        if ((size_t)(end - *pp) < 8) return 0;
        *pp += 8;
        return 1;
    case 5:
        if ((size_t)(end - *pp) < 4) return 0;
        *pp += 4;
        return 1;
    case 2:
        if (!read_varint(pp, end, &v) || v > (uint64_t)(end - *pp)) return 0;
        f->data = *pp;
        f->len = (size_t)v;
        *pp += v;
        return 1;
    default: /* groups: never written by wandb; treated as malformed */
        return 0;
    }
}

/* ---- growable buffers ---- */
typedef struct {
    uint8_t *data;
    size_t len, cap;
} Buf;

static int buf_reserve(Buf *b, size_t more) {
    if (b->len + more <= b->cap) return 1;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + more) cap *= 2;
    uint8_t *p = realloc(b->data, cap);
    if (!p) return 0;
    b->data = p;
    b->cap = cap;
    return 1;
}

static int buf_put(Buf *b, const void *src, size_t n) {
    if (n == 0) return 1; /* an empty chunk: memcpy from or to a NULL buffer is undefined even for 0 bytes */
    if (!buf_reserve(b, n)) return 0;
    memcpy(b->data + b->len, src, n);
    b->len += n;
    return 1;
}

/* ---- the fold: key id -> last value, first-seen order ---- */
typedef struct {
    size_t key_off, key_len; /* into Fold.keys */
    const uint8_t *value;    /* into the file's bytes or a kept assembled record */
    size_t value_len;
    uint64_t hash;
} Entry;

typedef struct {
    Entry *entries;
    size_t count, cap;
    int64_t *slots; /* index into entries, -1 empty */
    size_t nslots;
    Buf keys;
} Fold;

/* Python's own keyed hash (SipHash, its key drawn at random per process unless PYTHONHASHSEED fixes it): keys a
 * log's author crafted to collide cannot make the linear-probing table quadratic while the GIL is held. */
static uint64_t hash_bytes(const uint8_t *p, size_t n) {
#if PY_VERSION_HEX >= 0x030E0000
    return (uint64_t)Py_HashBuffer(p, (Py_ssize_t)n); /* public since 3.14: the same keyed hash */
#else
    return (uint64_t)_Py_HashBytes(p, (Py_ssize_t)n); /* private before 3.14, and the only way to it */
#endif
}

static int fold_grow(Fold *f) {
    size_t nslots = f->nslots ? f->nslots * 2 : 64;
    int64_t *slots = malloc(nslots * sizeof(int64_t));
    if (!slots) return 0;
    for (size_t i = 0; i < nslots; i++) slots[i] = -1;
    for (size_t e = 0; e < f->count; e++) {
        size_t i = f->entries[e].hash & (nslots - 1);
        while (slots[i] >= 0) i = (i + 1) & (nslots - 1);
        slots[i] = (int64_t)e;
    }
    free(f->slots);
    f->slots = slots;
    f->nslots = nslots;
    return 1;
}

static int fold_set(Fold *f, const uint8_t *key, size_t key_len, const uint8_t *value, size_t value_len) {
    if ((f->count + 1) * 2 > f->nslots && !fold_grow(f)) return 0;
    uint64_t h = hash_bytes(key, key_len);
    size_t i = h & (f->nslots - 1);
    while (f->slots[i] >= 0) {
        Entry *e = &f->entries[f->slots[i]];
        if (e->hash == h && e->key_len == key_len && memcmp(f->keys.data + e->key_off, key, key_len) == 0) {
            e->value = value;
            e->value_len = value_len;
            return 1;
        }
        i = (i + 1) & (f->nslots - 1);
    }
    if (f->count == f->cap) {
        size_t cap = f->cap ? f->cap * 2 : 32;
        Entry *entries = realloc(f->entries, cap * sizeof(Entry));
        if (!entries) return 0;
        f->entries = entries;
        f->cap = cap;
    }
    Entry *e = &f->entries[f->count];
    e->key_off = f->keys.len;
    e->key_len = key_len;
    e->value = value;
    e->value_len = value_len;
    e->hash = h;
    if (!buf_put(&f->keys, key, key_len)) return 0;
    f->slots[i] = (int64_t)f->count++;
    return 1;
}

static void fold_free(Fold *f) {
    free(f->entries);
    free(f->slots);
    free(f->keys.data);
}

static PyObject *fold_dict(Fold *f, int values) {
    PyObject *d = PyDict_New();
    if (!d) return NULL;
    for (size_t e = 0; e < f->count; e++) {
        Entry *en = &f->entries[e];
        PyObject *k = PyBytes_FromStringAndSize((const char *)f->keys.data + en->key_off, (Py_ssize_t)en->key_len);
        PyObject *v = values ? PyBytes_FromStringAndSize((const char *)en->value, (Py_ssize_t)en->value_len) : Py_NewRef(Py_None);
        if (!k || !v || PyDict_SetItem(d, k, v) < 0) {
            Py_XDECREF(k);
            Py_XDECREF(v);
            Py_DECREF(d);
            return NULL;
        }
        Py_DECREF(k);
        Py_DECREF(v);
    }
    return d;
}

/* ---- items and records ---- */
typedef struct {
    Fold *into;
    size_t id_off, id_len; /* into State.ids */
    const uint8_t *value;
    size_t value_len;
} Pending;

typedef struct {
    Fold history, summary, removed;
    Buf ids;          /* the key ids of the record being read */
    Pending *pending; /* its item updates, applied once the whole record has parsed */
    size_t npending, cap;
    size_t history_items;
} State;

/* One HistoryItem / SummaryItem (key = 1, nested_key = 2, value_json = 16) queued for `into`.
 * Returns 0 when malformed, -1 when out of memory. */
static int item(State *s, const uint8_t *p, const uint8_t *end, Fold *into) {
    const uint8_t *key = NULL, *value = (const uint8_t *)"", *q = p, *first = NULL;
    size_t key_len = 0, value_len = 0, parts = 0, first_len = 0;
    Field f;
    while (q < end) {
        if (!next_field(&q, end, &f)) return 0;
        if (f.wire != 2 || (f.number != 1 && f.number != 2 && f.number != 16)) continue;
        if (!utf8_valid(f.data, f.len)) return 0;
        if (f.number == 1) {
            key = f.data;
            key_len = f.len;
        } else if (f.number == 16) {
            value = f.data;
            value_len = f.len;
        } else if (parts++ == 0) {
            first = f.data;
            first_len = f.len;
        }
    }
    if (s->npending == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 64;
        Pending *pending = realloc(s->pending, cap * sizeof(Pending));
        if (!pending) return -1;
        s->pending = pending;
        s->cap = cap;
    }
    Pending *e = &s->pending[s->npending++];
    e->into = into;
    e->id_off = s->ids.len;
    e->value = value;
    e->value_len = value_len;
    if (key_len || parts == 1) { /* a key, or a nested key of one part: the same key to W&B */
        if (!key_len) {
            key = first;
            key_len = first_len;
        }
        if (!buf_put(&s->ids, "K", 1) || !buf_put(&s->ids, key, key_len)) return -1;
    } else {
        if (!buf_put(&s->ids, "N", 1)) return -1;
        for (q = p; q < end;) {
            next_field(&q, end, &f);
            if (f.wire == 2 && f.number == 2) {
                uint8_t n[4] = {(uint8_t)f.len, (uint8_t)(f.len >> 8), (uint8_t)(f.len >> 16), (uint8_t)(f.len >> 24)};
                if (!buf_put(&s->ids, n, 4) || !buf_put(&s->ids, f.data, f.len)) return -1;
            }
        }
    }
    e->id_len = s->ids.len - e->id_off;
    return 1;
}

/* HistoryRecord (item = 1) or SummaryRecord (update = 1, remove = 2); other fields are skipped. */
static int items_of(State *s, const uint8_t *p, const uint8_t *end, int history) {
    Field f;
    while (p < end) {
        if (!next_field(&p, end, &f)) return 0;
        if (f.wire != 2 || (f.number != 1 && (history || f.number != 2))) continue;
        int rc = item(s, f.data, f.data + f.len, history ? &s->history : f.number == 1 ? &s->summary : &s->removed);
        if (rc != 1) return rc;
    }
    return 1;
}

/* One record payload: history (2) and summary (3) are folded here, every other record goes to `others`.
 * A record whose wire format is broken, or whose items are, is dropped and counted, nothing of it kept.
 * Returns 0 on a Python error or when out of memory. */
static int record(State *s, const uint8_t *p, size_t n, PyObject *others, size_t *unparsable) {
    const uint8_t *q = p, *end = p + n;
    Field f;
    int has_items = 0, rc = 1;
    s->npending = 0;
    s->ids.len = 0;
    while (q < end && rc == 1) {
        if (!next_field(&q, end, &f))
            rc = 0;
        else if (f.wire == 2 && (f.number == 2 || f.number == 3)) {
            has_items = 1;
            rc = items_of(s, f.data, f.data + f.len, f.number == 2);
        }
    }
    if (rc < 0) {
        PyErr_NoMemory();
        return 0;
    }
    if (rc == 0) {
        (*unparsable)++;
        return 1;
    }
    if (!has_items) {
        PyObject *b = PyBytes_FromStringAndSize((const char *)p, (Py_ssize_t)n);
        if (!b) return 0;
        int appended = PyList_Append(others, b);
        Py_DECREF(b);
        return appended == 0;
    }
    for (size_t i = 0; i < s->npending; i++) {
        Pending *e = &s->pending[i];
        if (e->into == &s->history) s->history_items++;
        if (!fold_set(e->into, s->ids.data + e->id_off, e->id_len, e->value, e->value_len)) {
            PyErr_NoMemory();
            return 0;
        }
    }
    return 1;
}

static int add_damage(PyObject *list, int code, Py_ssize_t offset, Py_ssize_t a, Py_ssize_t b) {
    PyObject *t = Py_BuildValue("(innn)", code, offset, a, b);
    if (!t) return 0;
    int rc = PyList_Append(list, t);
    Py_DECREF(t);
    return rc == 0;
}

static int all_zero(const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i]) return 0;
    return 1;
}

static PyObject *scan(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer view;
    Py_ssize_t start;
    if (!PyArg_ParseTuple(args, "y*n", &view, &start)) return NULL;
    const uint8_t *data = view.buf;
    size_t size = (size_t)view.len, offset = start < 0 ? 0 : (size_t)start;
    State s;
    memset(&s, 0, sizeof s);
    Buf pending = {0};
    int have_pending = 0, truncated = 0;
    size_t pending_at = 0, records = 0, unparsable = 0;
    /* assembled records must outlive the scan's fold (values point into them) */
    uint8_t **kept = NULL;
    size_t nkept = 0, kept_cap = 0;
    PyObject *others = PyList_New(0), *damage = PyList_New(0), *result = NULL;
    if (!others || !damage) goto done;

    while (offset + HEADER_SIZE <= size) {
        size_t room = BLOCK - offset % BLOCK;
        if (room < HEADER_SIZE) { /* block trailer */
            offset += room;
            continue;
        }
        const uint8_t *h = data + offset;
        uint32_t checksum = (uint32_t)h[0] | (uint32_t)h[1] << 8 | (uint32_t)h[2] << 16 | (uint32_t)h[3] << 24;
        size_t length = (size_t)h[4] | (size_t)h[5] << 8;
        int kind = h[6];
        size_t end = offset + HEADER_SIZE + length;
        if (kind < FULL || kind > LAST || length > room - HEADER_SIZE) {
            size_t span = room < size - offset ? room : size - offset;
            if (!(checksum == 0 && length == 0 && kind == 0 && all_zero(h, span))) {
                if (!add_damage(damage, D_IMPOSSIBLE, (Py_ssize_t)offset, (Py_ssize_t)kind, (Py_ssize_t)length)) goto done;
                have_pending = 0;
            }
            offset += room;
            continue;
        }
        if (end > size) {
            if (!add_damage(damage, D_CUT, (Py_ssize_t)offset, (Py_ssize_t)(end - size), 0)) goto done;
            have_pending = 0;
            truncated = 1;
            break;
        }
        if (crc32_ieee(h + 6, length + 1) != checksum) {
            if (!add_damage(damage, D_CRC, (Py_ssize_t)offset, 0, 0)) goto done;
            offset += room;
            have_pending = 0;
            continue;
        }
        const uint8_t *chunk = h + HEADER_SIZE;
        size_t chunk_at = offset;
        offset = end;
        if (kind == FULL) {
            if (have_pending) {
                if (!add_damage(damage, D_ORPHAN, (Py_ssize_t)pending_at, 0, 0)) goto done;
                have_pending = 0;
            }
            records++;
            if (!record(&s, chunk, length, others, &unparsable)) goto done;
        } else if (kind == FIRST) {
            pending.len = 0;
            if (!buf_put(&pending, chunk, length)) goto oom;
            have_pending = 1;
            pending_at = chunk_at;
        } else if (have_pending) {
            if (!buf_put(&pending, chunk, length)) goto oom;
            if (kind == LAST) {
                if (nkept == kept_cap) { /* grown geometrically: one record split over blocks after another */
                    size_t cap = kept_cap ? kept_cap * 2 : 16;
                    uint8_t **k = realloc(kept, cap * sizeof(uint8_t *));
                    if (!k) goto oom;
                    kept = k;
                    kept_cap = cap;
                }
                kept[nkept++] = pending.data; /* hand the buffer to the fold */
                const uint8_t *whole = pending.data;
                size_t whole_len = pending.len;
                pending = (Buf){0};
                have_pending = 0;
                records++;
                if (!record(&s, whole, whole_len, others, &unparsable)) goto done;
            }
        } /* else: the middle or end of a record whose start was lost (already counted) */
    }
    if (have_pending) {
        if (!add_damage(damage, D_CUT_SPLIT, (Py_ssize_t)pending_at, 0, 0)) goto done;
    } else if (offset < size && !truncated && !all_zero(data + offset, size - offset)) {
        if (!add_damage(damage, D_STRAY, (Py_ssize_t)offset, (Py_ssize_t)(size - offset), 0)) goto done;
    }
    {
        PyObject *history = fold_dict(&s.history, 1), *summary = fold_dict(&s.summary, 1),
                 *removed = fold_dict(&s.removed, 0);
        if (history && summary && removed)
            result = Py_BuildValue("(nnnOOOOO)", (Py_ssize_t)records, (Py_ssize_t)unparsable,
                                   (Py_ssize_t)s.history_items, history, summary, removed, others, damage);
        Py_XDECREF(history);
        Py_XDECREF(summary);
        Py_XDECREF(removed);
    }
    goto done;
oom:
    if (!PyErr_Occurred()) PyErr_NoMemory();
done:
    if (PyErr_Occurred()) Py_CLEAR(result);
    Py_XDECREF(others);
    Py_XDECREF(damage);
    fold_free(&s.history);
    fold_free(&s.summary);
    fold_free(&s.removed);
    free(s.ids.data);
    free(s.pending);
    free(pending.data);
    for (size_t i = 0; i < nkept; i++) free(kept[i]);
    free(kept);
    PyBuffer_Release(&view);
    return result;
}

static PyObject *hash_for_tests(PyObject *self, PyObject *args) {
    Py_buffer view;
    if (!PyArg_ParseTuple(args, "y*", &view)) return NULL;
    uint64_t h = hash_bytes(view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLongLong(h);
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS, "Frame a .wandb file's records and fold its history and summary items."},
    {"_hash", hash_for_tests, METH_VARARGS, "The fold's hash of a key (tests: it is keyed per process)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_wandb_log", "The native .wandb reader.", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__wandb_log(void) {
    crc_init();
    return PyModule_Create(&module);
}
