# rlgate GPU image: SGLang serving engine + rlgate (gateway, worker, beat) in one image.
# Never built here: no registry is reachable for the base image. scripts/check_containers.sh
# lints it (hadolint) and says so.
#
#   docker build -t rlgate .
#   docker run --gpus all rlgate rlgate --help
#
# The base image brings CUDA, PyTorch and SGLang; rlgate installs on top with the
# `sglang` extra (already satisfied by the base, so nothing is re-downloaded).
ARG SGLANG_IMAGE=lmsysorg/sglang:v0.4.6.post5-cu124
FROM ${SGLANG_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    RLGATE_DATA_DIR=/data

WORKDIR /opt/rlgate
COPY pyproject.toml README.md alembic.ini ./
COPY rlgate ./rlgate
COPY core ./core
COPY gateway ./gateway
COPY trainer ./trainer
COPY schemas ./schemas
COPY engine ./engine
COPY migrations ./migrations
# the project itself from this directory (its dependencies are pinned by the base image
# and pyproject.toml), not a package from the index: DL3013 does not apply
# hadolint ignore=DL3013
RUN python3 -m pip install ".[sglang]"

RUN useradd --create-home --uid 1000 rlgate && mkdir -p /data && chown rlgate /data
USER 1000
VOLUME ["/data"]
EXPOSE 8000 30000
CMD ["rlgate", "--help"]
