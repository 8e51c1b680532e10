#!/bin/sh
# Installs flexmig into the image's root filesystem; runs INSIDE it (chroot from build.sh's mmdebstrap
# hook, or the Dockerfile's RUN), so both recipes end with the same /opt/flexmig.
#   install.sh WHEEL_DIR
# WHEEL_DIR holds the flexmig wheel and every dependency's wheel, built under
# deployments/constraints.txt; nothing is fetched from an index here.
set -eu
wheels="$1"

python3 -m venv /opt/flexmig
# --no-compile: the bytecode is compiled below, once, in a form valid on a read-only root filesystem.
/opt/flexmig/bin/pip install --no-index --no-cache-dir --no-compile --disable-pip-version-check \
  --find-links "$wheels" flexmig
# The installer itself is not needed at run time (nothing installs into a running image).
/opt/flexmig/bin/pip uninstall --yes --quiet --disable-pip-version-check pip setuptools

# A fixed numeric non-root user, so `runAsNonRoot: true` can verify it without a passwd lookup. The
# essential set has no useradd (package passwd), so the entries are written directly.
grep -q '^flexmig:' /etc/group || echo 'flexmig:x:65532:' >> /etc/group
grep -q '^flexmig:' /etc/passwd \
  || echo 'flexmig:x:65532:65532:flexmig:/nonexistent:/usr/sbin/nologin' >> /etc/passwd

# Bytecode for the venv and the standard library, checked against nothing at import time
# (unchecked-hash): the image is immutable and its root filesystem read-only (PYTHONDONTWRITEBYTECODE),
# and file times may be clamped to SOURCE_DATE_EPOCH, which would make timestamp-based .pyc stale and
# every start recompile in memory. -f: a .pyc already there (Debian's, or one written while installing)
# is replaced too.
python3 -m compileall -q -f -j 0 --invalidation-mode unchecked-hash \
  /usr/lib/python3.11 /usr/lib/python3/dist-packages /opt/flexmig/lib >/dev/null

# The hook's PATH is the builder's, not the image's.
/opt/flexmig/bin/flexmig --version
