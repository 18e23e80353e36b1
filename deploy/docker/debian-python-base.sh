#!/usr/bin/env bash
# Make a local stand-in for python:3.11-slim-bookworm where no registry is reachable: Debian bookworm from
# the Debian mirror (debootstrap), its Python 3.11 with pip and venv, imported with `docker import`.
# The host's CA bundle is copied in, so a TLS-intercepting proxy the host trusts works in the build too.
#
#   sudo deploy/docker/debian-python-base.sh [TAG]        # default TAG: wandb-assets-base:bookworm
#   docker build --build-arg BASE_IMAGE=wandb-assets-base:bookworm -t wandb-assets:dev .
set -euo pipefail
tag="${1:-wandb-assets-base:bookworm}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
rootfs="$(mktemp -d)"
trap 'rm -rf "$rootfs"' EXIT
command -v debootstrap >/dev/null || { echo "needs debootstrap (apt-get install debootstrap)" >&2; exit 2; }
debootstrap --variant=minbase --include=python3,python3-pip,python3-venv,ca-certificates,passwd bookworm "$rootfs" "$mirror"
# As in the official python image: `python` and `pip` commands, pip allowed to install into the system Python.
ln -sf python3 "$rootfs/usr/bin/python"
rm -f "$rootfs"/usr/lib/python3.*/EXTERNALLY-MANAGED
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
  cp /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/ca-certificates.crt"
fi
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
tar -C "$rootfs" -c . | docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt' \
  --change 'CMD ["python3"]' - "$tag"
echo "$tag"
