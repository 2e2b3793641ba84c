# PostgreSQL 15 (Debian bookworm) with pg_tide installed from its Debian package and enabled.
#
#   docker build -t pg_tide .
#   docker run -e POSTGRES_PASSWORD=secret -p 5432:5432 pg_tide
#   psql ... -c 'CREATE EXTENSION pg_tide'
#
# Stage 1 builds postgresql-15-pg-tide with the same scripts CI runs (scripts/setup.sh, then
# scripts/deb.sh); stage 2 installs that package with apt-get, which resolves its Depends from
# the image's PGDG and Debian repositories, and keeps neither the toolchain nor the build tree.
# Built with internet access (rustup).
FROM postgres:15-bookworm AS build

ENV DEBIAN_FRONTEND=noninteractive \
    RUSTUP_HOME=/usr/local/rustup \
    CARGO_HOME=/usr/local/cargo \
    PATH=/usr/local/cargo/bin:$PATH

RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl build-essential dpkg-dev git \
 && rm -rf /var/lib/apt/lists/*

RUN curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs \
      | sh -s -- -y --profile minimal --default-toolchain 1.95.0 \
 && cargo --version

WORKDIR /usr/src/pg_tide
COPY . .

# setup.sh: Debian packages (from the image's PGDG apt repository), cargo-pgrx 0.18.0,
# `cargo pgrx init --pg15`. deb.sh: the release build, packaged as /out/*.deb.
RUN bash scripts/setup.sh \
 && mkdir -p /out \
 && TIDE_SKIP_SETUP=1 bash scripts/deb.sh /out

FROM postgres:15-bookworm
COPY --from=build /out/postgresql-15-pg-tide_*.deb /tmp/
RUN apt-get update \
 && apt-get install -y --no-install-recommends /tmp/postgresql-15-pg-tide_*.deb \
 && rm -rf /var/lib/apt/lists/* /tmp/postgresql-15-pg-tide_*.deb

CMD ["postgres", "-c", "wal_level=logical", "-c", "shared_preload_libraries=pg_tide"]
