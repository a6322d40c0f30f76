# Kiln: one image for every role of a fleet (API, worker, migrations, TVM RPC tracker and server).
# The role is the command: `docker run kiln serve ...`, `... worker`, `... rpc tracker ...`; see docker-compose.yml.
#
# Debian, not Alpine: the apache-tvm wheel is manylinux x86_64 (glibc). The wheel links only glibc,
# libstdc++ and libgcc_s (LLVM is linked into libtvm_compiler.so statically; xgboost and psycopg bring their
# own libgomp and libpq), all in the slim image. g++ is needed at run time: TVM links every exported model
# library (`export_library`) with the system C++ compiler, and an RPC server links the modules it receives.
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    KILN_DATA_DIR=/data

RUN apt-get update \
    && apt-get install -y --no-install-recommends g++ \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /src

# Dependencies first, in their own layer, so that editing Kiln's code does not reinstall TVM (~1 GB).
COPY pyproject.toml ./
RUN python -c "import subprocess, sys, tomllib; \
deps = tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']; \
subprocess.check_call([sys.executable, '-m', 'pip', 'install', '--no-cache-dir', *deps])"

COPY . .
RUN pip install --no-cache-dir .

# Non-root. /data is created here, owned by kiln, so that a named volume mounted on it starts out
# writable by kiln (Docker copies the image's ownership into an empty named volume).
RUN useradd --system --uid 10001 --create-home --home-dir /home/kiln kiln \
    && mkdir -p /data \
    && chown kiln:kiln /data
USER kiln
WORKDIR /home/kiln

# 8000: `kiln serve` (API and dashboard); 9190: `kiln rpc tracker`; 9090: `kiln rpc server`.
EXPOSE 8000 9190 9090

# Only meaningful for `serve`: docker-compose.yml disables it for the other roles. No curl in slim images.
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('KILN_PORT', '8000') + '/healthz', timeout=4)"]

ENTRYPOINT ["kiln"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8000"]
