# The appliance as a container: the standalone executable (the same build and run steps as the
# smoke test, tests/packaging/test_smoke.py) in a small image.
#
#   docker build --build-arg REVISION=$(git rev-parse --short=12 HEAD) -t appliance .
#   docker run -d -p 7777:7777 -v appliance-data:/data -e APPLIANCE_PUBLIC_URL=wss://relay.example.org appliance
#
# Same defaults as the binary, but it listens on 0.0.0.0 inside the container (publish the port
# deliberately) and keeps its data in the /data volume. Commands run the same way:
#   docker exec <container> appliance doctor
#   docker exec <container> appliance backup /data/backups/today.sqlite3

# --- build: `make dist` (the locked build: uv from uv.lock, hash-checked, then `uv sync --locked`
# with the build extras; htmx from the npm registry, integrity checked; PyInstaller) ---------------
FROM python:3.11-slim-bookworm AS build
RUN apt-get update && apt-get install -y --no-install-recommends binutils make npm \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml uv.lock LICENSE README.md Makefile ./
COPY appliance ./appliance
COPY templates ./templates
COPY static ./static
COPY packaging ./packaging
ARG REVISION=unknown
ENV APPLIANCE_REVISION=${REVISION}
RUN make dist

# --- run: the executable alone, as a user of its own --------------------------------------------
FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates curl \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --home-dir /data --shell /usr/sbin/nologin appliance \
    && mkdir -p /data && chown appliance:appliance /data && chmod 0700 /data
COPY --from=build /src/dist/appliance /usr/local/bin/appliance
USER appliance
ENV APPLIANCE_DATA_DIR=/data \
    APPLIANCE_HOST=0.0.0.0 \
    APPLIANCE_PORT=7777
VOLUME /data
EXPOSE 7777
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD curl -fsS "http://127.0.0.1:${APPLIANCE_PORT}/admin/health" || exit 1
ENTRYPOINT ["/usr/local/bin/appliance"]
CMD ["serve"]
