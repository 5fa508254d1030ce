# sluice container image: built with Rust on Debian 12 (bookworm), run on
# debian:bookworm-slim as an unprivileged user. Needs BuildKit (the default
# builder since Docker 23; podman/buildah also understand RUN --mount).
#
#   docker build -t sluice .
#   docker run -d -p 6432:6432 -p 9127:9127 -v "$PWD/conf:/etc/sluice:ro" sluice
#
# The mounted directory holds sluice.ini (pgbouncer.ini format; start from
# packaging/docker/sluice.ini) and the userlist.txt it names. See
# docs/packaging.md.

ARG RUST_VERSION=1.95

FROM rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
# The whole workspace (cargo reads every member's manifest); .dockerignore
# keeps target/, the lab and the driver suites out of the context.
COPY Cargo.toml Cargo.lock ./
COPY crates crates
COPY tests tests
# The release profile keeps line tables (debug = 1); the image gets the
# binary without them but with its symbol table, as the .deb does.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p sluice \
    && strip --strip-debug -o /sluice target/release/sluice

FROM debian:bookworm-slim
LABEL org.opencontainers.image.title="sluice" \
      org.opencontainers.image.description="PostgreSQL connection pooler, a drop-in PgBouncer replacement" \
      org.opencontainers.image.licenses="MIT"
# A fixed numeric uid/gid, so that runAsNonRoot-style checks can see the
# image does not run as root. /run/sluice holds the Unix socket.
RUN groupadd --gid 10001 sluice \
    && useradd --uid 10001 --gid sluice --no-log-init --no-create-home \
       --home-dir /nonexistent --shell /usr/sbin/nologin sluice \
    && install -d -o sluice -g sluice -m 0755 /run/sluice \
    && install -d -m 0755 /etc/sluice \
    && printf '%s\n' ';; "user" "password" (plain text, md5 or SCRAM secret), one per line' \
       > /etc/sluice/userlist.txt \
    && chown root:sluice /etc/sluice/userlist.txt \
    && chmod 0640 /etc/sluice/userlist.txt
COPY --from=build /sluice /usr/bin/sluice
COPY packaging/docker/sluice.ini /etc/sluice/sluice.ini
COPY --chmod=0755 packaging/docker/healthcheck /usr/local/bin/sluice-healthcheck

USER 10001:10001
# 6432: PostgreSQL clients; 9127: /metrics and /health (metrics_addr).
EXPOSE 6432 9127
# As PgBouncer's systemd unit: SIGINT lets each client finish its
# transaction, then exits (SIGTERM would wait for every client to leave).
STOPSIGNAL SIGINT
# /health answers 200 when sluice can serve, 503 while paused, shutting
# down, or when a pool's server logins keep failing. No curl in the image:
# the check is a bash /dev/tcp request.
HEALTHCHECK --interval=10s --timeout=5s --start-period=5s --retries=3 \
    CMD ["/usr/local/bin/sluice-healthcheck", "127.0.0.1:9127"]
ENTRYPOINT ["/usr/bin/sluice"]
CMD ["/etc/sluice/sluice.ini"]
