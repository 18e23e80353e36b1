/* The native half of wandb_assets.lib.curves' parse. First, the system stream: one pass over each event text W&B
 * sent (a JSON object as a string) that reads the GPU samples of the events whose text is plain (every value a JSON
 * number, no key written with an escape), so the parse in DuckDB is left only the others (issue 54: splitting,
 * keying and parsing 10,000 events a request in SQL cost 3.2 ms of CPU a run; this pass ~0.5).
 *
 * It takes an event only where its rules are the general ones without a choice to make (curves.py, the parse's
 * rules; tests/reference/curves.py): a flat object, every value a finite JSON number (an integer of at most 18
 * digits, else a number as Python's float() reads it, correctly rounded), no key with an escape or a control
 * character, no GPU index written with a leading zero (two keys could then name one reading). Every other event is
 * handed back untouched, for the parse in DuckDB. In a taken event: its time is the first `_timestamp`; a key twice:
 * its first value; `system.gpu.<i>.<what>` (1-4 ASCII digits, i below MAX_GPUS, `what` ASCII letters) gives GPU i a
 * row: util (`gpu`), memory (`memory`), power (`powerWatts`), NaN where the event has none (NULL in DuckDB).
 *
 * gpu_samples(runs: list) -> (r, ord, seconds, gpu, util, memory, power, rest)
 *     runs: one entry per run (its place `r`): a list of events, or anything else (no events)
 *     r, ord, gpu: bytes of int32 (the run's place; the event's place in its list, from 1; the GPU)
 *     seconds, util, memory, power: bytes of float64, one row per GPU of a taken event with a `_timestamp`
 *         (seconds since 1970, as sent: DuckDB keeps those from 1970 to before the year 10000, the one rule)
 *     rest: [(r, ord, event)] of every event not taken, in order
 *
 * The history (`sampledHistory`, already Python objects: the client parsed the answer) the same way, for the rules
 * of curves.py and tests/reference/curves.py: each spec's list of dicts, the spec of keys[i] the i-th list (zip: the
 * shorter ends it); a point needs a number `_step` (an int or a float, not a bool, finite as a double) and a number
 * under its key; its time is `_timestamp` when a number. Every such point is kept, in order: DuckDB keeps those whose
 * step is whole and fits a BIGINT (one rule for every path) and the first of a step in a series (W&B's samples never
 * repeat one).
 *
 * history_points(keys: list, sampled: list) -> (r, i, ord, step, seconds, value, left)
 *     keys, sampled: one entry per run (its place `r`): its metric keys (a list of str), what W&B sent (None: the
 *         run is not read)
 *     r, i, ord: bytes of int32 (the run's place; the spec's from 1; the point's place in its list, from 1)
 *     step, seconds, value: bytes of float64 (step whole; seconds NaN where `_timestamp` is no number)
 *     left: [r] of the runs whose history holds a point of a type JSON does not give: parsed in DuckDB
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define MAX_GPUS 4096 /* accounting.gpus.MAX_GPUS: the module's MAX_GPUS, compared by a test */
#define NUMBER_TEXT 64

typedef struct {
    char *data;
    size_t len, cap;
} Buf;

static int put(Buf *b, const void *value, size_t n) {
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n) cap *= 2;
        char *grown = PyMem_Realloc(b->data, cap);
        if (!grown) {
            PyErr_NoMemory();
            return -1;
        }
        b->data = grown;
        b->cap = cap;
    }
    memcpy(b->data + b->len, value, n);
    b->len += n;
    return 0;
}

enum { UTIL, MEMORY, POWER, READINGS };

typedef struct {
    int32_t gpu;
    double reading[READINGS];
} Gpu;

typedef struct {
    Buf r, ord, seconds, gpu, util, memory, power;
    int16_t slot[MAX_GPUS]; /* the event's entry of a GPU in `gpus`, -1: none yet */
    Gpu gpus[MAX_GPUS];
    int32_t count;
} Scan;

static inline int is_digit(char c) { return c >= '0' && c <= '9'; }
static inline int is_letter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

static inline const char *space(const char *p, const char *end) {
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) p++;
    return p;
}

/* Exact powers of ten as doubles (10^22 is the last one a double holds exactly). */
static const double POWERS[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                                1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* A JSON number at p: its end, with its value in *out as Python's float() reads it (correctly rounded); NULL when
 * there is none, or it is one the general path must read (an integer of more than 18 digits). */
static const char *number(const char *p, const char *end, double *out) {
    const char *start = p;
    int negative = 0, digits = 0, whole = 1, exponent = 0;
    uint64_t mantissa = 0; /* of the first 19 digits; `digits` counts them all */
    if (p < end && *p == '-') {
        negative = 1;
        p++;
    }
    if (p == end || !is_digit(*p)) return NULL;
    if (*p == '0') {
        p++;
    } else {
        for (; p < end && is_digit(*p); p++, digits++)
            if (digits < 19) mantissa = mantissa * 10 + (uint64_t)(*p - '0');
            else exponent++;
    }
    int integer_digits = digits;
    if (p < end && *p == '.') {
        whole = 0;
        p++;
        if (p == end || !is_digit(*p)) return NULL;
        for (; p < end && is_digit(*p); p++) {
            if (digits == 0 && *p == '0') {
                exponent--; /* a leading zero of the fraction: no significant digit yet */
                continue;
            }
            if (digits < 19) {
                mantissa = mantissa * 10 + (uint64_t)(*p - '0');
                exponent--;
            }
            digits++;
        }
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        whole = 0;
        p++;
        int sign = 1, written = 0;
        if (p < end && (*p == '+' || *p == '-')) sign = *p++ == '-' ? -1 : 1;
        if (p == end || !is_digit(*p)) return NULL;
        for (; p < end && is_digit(*p); p++)
            if (written < 100000) written = written * 10 + (*p - '0');
        exponent += sign * written;
    }
    if (whole && integer_digits > 18) return NULL;
    /* Clinger's fast path: a mantissa a double holds exactly, scaled by an exact power of ten, is one rounding */
    if (digits <= 19 && mantissa <= (1ULL << 53) && exponent >= -22 && exponent <= 22) {
        double value = (double)mantissa;
        value = exponent < 0 ? value / POWERS[-exponent] : value * POWERS[exponent];
        *out = negative && !(whole && mantissa == 0) ? -value : value; /* -0 is the integer 0, as in Python */
        return p;
    }
    size_t n = (size_t)(p - start);
    char small[NUMBER_TEXT], *text = n < NUMBER_TEXT ? small : PyMem_Malloc(n + 1);
    if (!text) return NULL;
    memcpy(text, start, n);
    text[n] = '\0';
    char *stop = NULL;
    double value = PyOS_string_to_double(text, &stop, NULL); /* as float(): correctly rounded, no locale */
    int read = stop == text + n;
    if (text != small) PyMem_Free(text);
    if (value == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        return NULL;
    }
    if (!read) return NULL;
    *out = value;
    return p;
}

/* One event's text: 1 taken (its rows added), 0 left for the general path, -1 out of memory. */
static int scan_event(Scan *s, const char *text, Py_ssize_t size, int32_t r, int32_t ord) {
    const char *p = text, *end = text + size;
    int timed = 0, taken = 0;
    double seconds = 0;
    s->count = 0;
    p = space(p, end);
    if (p == end || *p != '{') goto done;
    p = space(p + 1, end);
    if (p < end && *p == '}') {
        p++;
    } else {
        for (;;) {
            if (p == end || *p != '"') goto done;
            const char *key = ++p;
            while (p < end && *p != '"') {
                if (*p == '\\' || (unsigned char)*p < 0x20) goto done;
                p++;
            }
            if (p == end) goto done;
            const char *key_end = p++;
            p = space(p, end);
            if (p == end || *p != ':') goto done;
            double value;
            p = number(space(p + 1, end), end, &value);
            if (!p || !isfinite(value)) goto done;
            size_t length = (size_t)(key_end - key);
            if (length == 10 && memcmp(key, "_timestamp", 10) == 0) {
                if (!timed) {
                    timed = 1;
                    seconds = value;
                }
            } else if (length > 11 && memcmp(key, "system.gpu.", 11) == 0) {
                const char *q = key + 11;
                int gpu = 0, digits = 0;
                while (q < key_end && is_digit(*q) && digits < 5) {
                    gpu = gpu * 10 + (*q - '0');
                    q++;
                    digits++;
                }
                const char *what = q + 1;
                int letters = what < key_end;
                for (const char *c = what; c < key_end && letters; c++) letters = is_letter(*c);
                if (digits >= 1 && digits <= 4 && q < key_end && *q == '.' && letters) {
                    if (digits > 1 && key[11] == '0') goto done;
                    if (gpu < MAX_GPUS) {
                        int at = s->slot[gpu];
                        if (at < 0) {
                            at = s->count++;
                            s->slot[gpu] = (int16_t)at;
                            s->gpus[at].gpu = gpu;
                            for (int k = 0; k < READINGS; k++) s->gpus[at].reading[k] = NAN;
                        }
                        size_t n = (size_t)(key_end - what);
                        int which = n == 3 && memcmp(what, "gpu", 3) == 0      ? UTIL
                                    : n == 6 && memcmp(what, "memory", 6) == 0 ? MEMORY
                                    : n == 10 && memcmp(what, "powerWatts", 10) == 0 ? POWER
                                                                                        : READINGS;
                        if (which < READINGS && isnan(s->gpus[at].reading[which])) s->gpus[at].reading[which] = value;
                    }
                }
            }
            p = space(p, end);
            if (p == end) goto done;
            if (*p == ',') {
                p = space(p + 1, end);
                continue;
            }
            if (*p != '}') goto done;
            p++;
            break;
        }
    }
    if (space(p, end) != end) goto done;
    taken = 1;
    if (timed) {
        for (int32_t k = 0; k < s->count; k++) {
            Gpu *g = &s->gpus[k];
            if (put(&s->r, &r, 4) || put(&s->ord, &ord, 4) || put(&s->seconds, &seconds, 8) ||
                put(&s->gpu, &g->gpu, 4) || put(&s->util, &g->reading[UTIL], 8) ||
                put(&s->memory, &g->reading[MEMORY], 8) || put(&s->power, &g->reading[POWER], 8)) {
                taken = -1;
                break;
            }
        }
    }
done:
    for (int32_t k = 0; k < s->count; k++) s->slot[s->gpus[k].gpu] = -1;
    s->count = 0;
    return taken;
}

static void release(Scan *s) {
    Buf *bufs[] = {&s->r, &s->ord, &s->seconds, &s->gpu, &s->util, &s->memory, &s->power};
    for (size_t k = 0; k < sizeof bufs / sizeof *bufs; k++) PyMem_Free(bufs[k]->data);
    PyMem_Free(s);
}

static PyObject *as_bytes(Buf *b) { return PyBytes_FromStringAndSize(b->data ? b->data : "", (Py_ssize_t)b->len); }

static PyObject *gpu_samples(PyObject *self, PyObject *args) {
    PyObject *runs;
    if (!PyArg_ParseTuple(args, "O!", &PyList_Type, &runs)) return NULL;
    Scan *s = PyMem_Calloc(1, sizeof(Scan));
    if (!s) return PyErr_NoMemory();
    memset(s->slot, 0xff, sizeof s->slot);
    PyObject *rest = PyList_New(0);
    if (!rest) goto fail;
    Py_ssize_t n_runs = PyList_GET_SIZE(runs);
    if (n_runs > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "too many runs");
        goto fail;
    }
    for (Py_ssize_t r = 0; r < n_runs; r++) {
        PyObject *events = PyList_GET_ITEM(runs, r);
        if (!PyList_Check(events)) continue;
        Py_ssize_t n_events = PyList_GET_SIZE(events);
        if (n_events >= INT32_MAX) {
            PyErr_SetString(PyExc_ValueError, "too many events");
            goto fail;
        }
        for (Py_ssize_t k = 0; k < n_events; k++) {
            PyObject *event = PyList_GET_ITEM(events, k);
            int taken = 0;
            if (PyUnicode_Check(event)) {
                Py_ssize_t size;
                const char *text = PyUnicode_AsUTF8AndSize(event, &size);
                if (text) {
                    taken = scan_event(s, text, size, (int32_t)r, (int32_t)(k + 1));
                    if (taken < 0) goto fail;
                } else {
                    PyErr_Clear(); /* a lone surrogate: no UTF-8 for it; the general path's */
                }
            }
            if (!taken) {
                PyObject *left = Py_BuildValue("(nnO)", r, k + 1, event);
                if (!left || PyList_Append(rest, left) < 0) {
                    Py_XDECREF(left);
                    goto fail;
                }
                Py_DECREF(left);
            }
        }
    }
    PyObject *result = Py_BuildValue("(NNNNNNNN)", as_bytes(&s->r), as_bytes(&s->ord), as_bytes(&s->seconds),
                                     as_bytes(&s->gpu), as_bytes(&s->util), as_bytes(&s->memory),
                                     as_bytes(&s->power), rest);
    release(s);
    return result;
fail:
    Py_XDECREF(rest);
    release(s);
    return NULL;
}

/* A JSON value the client parsed, as a finite double: 1 (in *out), 0 none (not an int or a float, a bool, beyond a
 * double, NaN, an infinity), -1 an error. */
static int finite_number(PyObject *value, double *out) {
    if (!value || PyBool_Check(value)) return 0;
    if (PyFloat_Check(value)) {
        *out = PyFloat_AS_DOUBLE(value);
    } else if (PyLong_Check(value)) {
        *out = PyLong_AsDouble(value); /* as float(): correctly rounded */
        if (*out == -1.0 && PyErr_Occurred()) {
            if (!PyErr_ExceptionMatches(PyExc_OverflowError)) return -1;
            PyErr_Clear();
            return 0;
        }
    } else {
        return 0;
    }
    return isfinite(*out) ? 1 : 0;
}

typedef struct {
    Buf r, i, ord, step, seconds, value;
} History;

static PyObject *step_key, *time_key;

/* One run's history: 1 read (its points added), 0 left for DuckDB, -1 an error. */
static int history_of(History *h, PyObject *keys, PyObject *sampled, int32_t r) {
    if (!PyList_Check(sampled) || !PyList_Check(keys)) return 1; /* no series: no point, as in DuckDB */
    Py_ssize_t series = PyList_GET_SIZE(sampled) < PyList_GET_SIZE(keys) ? PyList_GET_SIZE(sampled)
                                                                         : PyList_GET_SIZE(keys);
    for (Py_ssize_t k = 0; k < series; k++) {
        PyObject *points = PyList_GET_ITEM(sampled, k), *key = PyList_GET_ITEM(keys, k);
        if (!PyList_Check(points)) continue;
        for (Py_ssize_t n = 0; n < PyList_GET_SIZE(points); n++) {
            PyObject *point = PyList_GET_ITEM(points, n);
            if (!PyDict_Check(point)) { /* JSON's other values are no point; anything else: DuckDB's */
                if (point == Py_None || PyList_Check(point) || PyUnicode_Check(point) || PyLong_Check(point) ||
                    PyFloat_Check(point))
                    continue;
                return 0;
            }
            double step, value, seconds;
            PyObject *found = PyDict_GetItemWithError(point, step_key);
            int is = found ? finite_number(found, &step) : 0;
            if (is < 0 || (!found && PyErr_Occurred())) return -1;
            if (!is) continue;
            found = PyUnicode_Check(key) ? PyDict_GetItemWithError(point, key) : NULL;
            is = found ? finite_number(found, &value) : 0;
            if (is < 0 || (!found && PyErr_Occurred())) return -1;
            if (!is) continue;
            found = PyDict_GetItemWithError(point, time_key);
            is = found ? finite_number(found, &seconds) : 0;
            if (is < 0 || (!found && PyErr_Occurred())) return -1;
            if (!is) seconds = NAN;
            int32_t spec = (int32_t)(k + 1), place = (int32_t)(n + 1);
            if (put(&h->r, &r, 4) || put(&h->i, &spec, 4) || put(&h->ord, &place, 4) || put(&h->step, &step, 8) ||
                put(&h->seconds, &seconds, 8) || put(&h->value, &value, 8))
                return -1;
        }
    }
    return 1;
}

static PyObject *history_points(PyObject *self, PyObject *args) {
    PyObject *keys, *sampled, *left = NULL;
    if (!PyArg_ParseTuple(args, "O!O!", &PyList_Type, &keys, &PyList_Type, &sampled)) return NULL;
    if (PyList_GET_SIZE(keys) != PyList_GET_SIZE(sampled) || PyList_GET_SIZE(sampled) > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "keys and sampled: one entry per run");
        return NULL;
    }
    History h = {0};
    Buf *bufs[] = {&h.r, &h.i, &h.ord, &h.step, &h.seconds, &h.value};
    left = PyList_New(0);
    if (!left) goto fail;
    for (Py_ssize_t r = 0; r < PyList_GET_SIZE(sampled); r++) {
        PyObject *run = PyList_GET_ITEM(sampled, r);
        if (run == Py_None) continue;
        size_t kept[6];
        for (int b = 0; b < 6; b++) kept[b] = bufs[b]->len;
        int read = history_of(&h, PyList_GET_ITEM(keys, r), run, (int32_t)r);
        if (read < 0) goto fail;
        if (!read) {
            for (int b = 0; b < 6; b++) bufs[b]->len = kept[b]; /* none of its points: DuckDB reads them all */
            PyObject *place = PyLong_FromSsize_t(r);
            if (!place || PyList_Append(left, place) < 0) {
                Py_XDECREF(place);
                goto fail;
            }
            Py_DECREF(place);
        }
    }
    PyObject *result = Py_BuildValue("(NNNNNNN)", as_bytes(&h.r), as_bytes(&h.i), as_bytes(&h.ord),
                                     as_bytes(&h.step), as_bytes(&h.seconds), as_bytes(&h.value), left);
    for (int b = 0; b < 6; b++) PyMem_Free(bufs[b]->data);
    return result;
fail:
    Py_XDECREF(left);
    for (int b = 0; b < 6; b++) PyMem_Free(bufs[b]->data);
    return NULL;
}

static PyMethodDef methods[] = {
    {"gpu_samples", gpu_samples, METH_VARARGS, "The GPU samples of the events whose text is plain; the rest."},
    {"history_points", history_points, METH_VARARGS, "The points of each run's sampled history; the runs left."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_curves_scan", "The native scan of a run's curves (curves.py).", -1, methods, NULL, NULL,
    NULL, NULL,
};

PyMODINIT_FUNC PyInit__curves_scan(void) {
    step_key = PyUnicode_InternFromString("_step");
    time_key = PyUnicode_InternFromString("_timestamp");
    if (!step_key || !time_key) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m && PyModule_AddIntConstant(m, "MAX_GPUS", MAX_GPUS) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
