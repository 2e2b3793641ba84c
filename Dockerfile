# PostgreSQL (15 by default; 16, 17 or 18 with --build-arg PG_MAJOR=NN; Debian bookworm, the
# official postgres image) with pg_tide installed from its Debian package and enabled.
#
#   docker build -t pg_tide .                                   # PostgreSQL 15
#   docker build --build-arg PG_MAJOR=17 -t pg_tide:17 .        # PostgreSQL 17
#   docker run -e POSTGRES_PASSWORD=secret -p 5432:5432 pg_tide
#   psql ... -c 'CREATE EXTENSION pg_tide'
#
# Stage 1 builds postgresql-NN-pg-tide with the same scripts CI runs (scripts/setup.sh, then
# scripts/deb.sh) against the image's own PostgreSQL NN (the PGDG's postgresql-server-dev-NN, so
# setup.sh downloads no other build of it: TIDE_PG_BIN names it); stage 2 installs that package
# with apt-get, which resolves its Depends from the image's PGDG and Debian repositories, and
# keeps neither the toolchain nor the build tree. Built with internet access (rustup).
ARG PG_MAJOR=15
FROM postgres:${PG_MAJOR}-bookworm AS build
ARG PG_MAJOR

ENV DEBIAN_FRONTEND=noninteractive \
    RUSTUP_HOME=/usr/local/rustup \
    CARGO_HOME=/usr/local/cargo \
    PATH=/usr/local/cargo/bin:$PATH

RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl build-essential dpkg-dev git \
      "postgresql-server-dev-${PG_MAJOR}" \
 && rm -rf /var/lib/apt/lists/*

RUN curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs \
      | sh -s -- -y --profile minimal --default-toolchain 1.95.0 \
 && cargo --version

WORKDIR /usr/src/pg_tide
COPY . .

# setup.sh: Debian packages (from the image's PGDG apt repository), cargo-pgrx 0.18.0,
# `cargo pgrx init` for the image's PostgreSQL. deb.sh: the release build, packaged as /out/*.deb.
RUN export TIDE_PG="${PG_MAJOR}" TIDE_PG_BIN="/usr/lib/postgresql/${PG_MAJOR}/bin" \
 && bash scripts/setup.sh \
 && mkdir -p /out \
 && TIDE_SKIP_SETUP=1 bash scripts/deb.sh /out

FROM postgres:${PG_MAJOR}-bookworm
ARG PG_MAJOR
COPY --from=build /out/postgresql-*-pg-tide_*.deb /tmp/
RUN apt-get update \
 && apt-get install -y --no-install-recommends /tmp/postgresql-${PG_MAJOR}-pg-tide_*.deb \
 && rm -rf /var/lib/apt/lists/* /tmp/postgresql-*-pg-tide_*.deb

CMD ["postgres", "-c", "wal_level=logical", "-c", "shared_preload_libraries=pg_tide"]
