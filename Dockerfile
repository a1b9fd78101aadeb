# recall in a container: a release build in the Rust image, run from slim
# Debian as an unprivileged user.
#
#   docker build -t recall .
#   docker run --rm -p 127.0.0.1:8080:8080 -e OPENAI_API_KEY -v recall-data:/data recall
#
# In the image recall listens on 0.0.0.0:8080 (RECALL_LISTEN), reads
# /app/config/recall.toml (RECALL_CONFIG; every example in config/ is
# shipped beside it) and keeps its SQLite file in the volume /data
# (RECALL_STORAGE_PATH). These variables win over the config file's
# `server.listen` and `storage.path`.

ARG RUST_VERSION=1.95

FROM rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src

# The dependencies first, built against stub sources, so that this layer is
# rebuilt only when Cargo.toml or Cargo.lock change. The stubs of the
# benches and of the example in benches/ are there because cargo wants
# every target the manifest declares to exist.
COPY Cargo.toml Cargo.lock ./
COPY crates/recall-core/Cargo.toml ./crates/recall-core/
COPY crates/recall-store/Cargo.toml ./crates/recall-store/
RUN mkdir -p src benches/memory crates/recall-core/src crates/recall-store/src \
    && echo 'fn main() {}' > src/main.rs \
    && touch src/lib.rs crates/recall-core/src/lib.rs crates/recall-store/src/lib.rs \
    && for b in load pure naive_hop embedder memory/main; do echo 'fn main() {}' > benches/$b.rs; done \
    && cargo build --release --locked --bin recall \
    && rm -rf src benches crates/recall-core/src crates/recall-store/src

# Then recall itself. COPY keeps the files' modification times, which can be
# older than the stub build; the touch makes cargo rebuild the crate.
COPY src ./src
COPY crates ./crates
COPY benches ./benches
RUN touch src/lib.rs src/main.rs crates/recall-core/src/lib.rs crates/recall-store/src/lib.rs \
    && cargo build --release --locked --bin recall \
    && install -m 0755 target/release/recall /usr/local/bin/recall

FROM debian:bookworm-slim
# TLS roots are compiled into the binary (webpki-roots), so the image needs
# no ca-certificates. /data is owned by the unprivileged user before it
# becomes a volume, so that a new named volume starts out writable.
RUN groupadd --system --gid 10001 recall \
    && useradd --system --uid 10001 --gid recall --no-create-home \
       --home-dir /nonexistent --shell /usr/sbin/nologin recall \
    && mkdir -p /data \
    && chown recall:recall /data
COPY --from=build /usr/local/bin/recall /usr/local/bin/recall
COPY config/ /app/config/
WORKDIR /app
ENV RECALL_CONFIG=/app/config/recall.toml \
    RECALL_LISTEN=0.0.0.0:8080 \
    RECALL_STORAGE_PATH=/data/recall.db
VOLUME ["/data"]
EXPOSE 8080
USER recall

# The image has no curl: bash's /dev/tcp asks GET /readyz (200 once storage
# answers) on the port that RECALL_LISTEN names.
HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 \
    CMD ["bash", "-c", "exec 3<>\"/dev/tcp/127.0.0.1/${RECALL_LISTEN##*:}\" && printf 'GET /readyz HTTP/1.1\\r\\nHost: localhost\\r\\nConnection: close\\r\\n\\r\\n' >&3 && read -r -t 4 _ code _ <&3 && [ \"$code\" = 200 ]"]

# recall ends gracefully on SIGTERM (`docker stop`): replies in flight get
# `server.shutdown_grace_secs` (30 s in the shipped config) to finish, so
# give `docker stop` a longer timeout, e.g. `docker stop -t 40`.
ENTRYPOINT ["/usr/local/bin/recall"]
