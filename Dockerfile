# PostgreSQL 15 (Debian bookworm) with pg_tide installed and enabled.
#
#   docker build -t pg_tide .
#   docker run -e POSTGRES_PASSWORD=secret -p 5432:5432 pg_tide
#   psql ... -c 'CREATE EXTENSION pg_tide'
#
# Built with internet access (rustup); the image keeps the toolchain but not target/.
FROM postgres:15-bookworm

ENV DEBIAN_FRONTEND=noninteractive \
    RUSTUP_HOME=/usr/local/rustup \
    CARGO_HOME=/usr/local/cargo \
    PATH=/usr/local/cargo/bin:$PATH

RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl build-essential \
 && rm -rf /var/lib/apt/lists/*

RUN curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs \
      | sh -s -- -y --profile minimal --default-toolchain 1.95.0 \
 && cargo --version

WORKDIR /usr/src/pg_tide
COPY . .

# setup.sh: Debian packages (from the image's PGDG apt repository), cargo-pgrx 0.18.0,
# `cargo pgrx init --pg15`. install.sh: release build into the image's PostgreSQL 15.
RUN bash scripts/setup.sh \
 && TIDE_SKIP_SETUP=1 bash scripts/install.sh \
 && rm -rf target /usr/local/cargo/registry /var/lib/apt/lists/*

CMD ["postgres", "-c", "wal_level=logical", "-c", "shared_preload_libraries=pg_tide"]
