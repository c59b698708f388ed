# syntax=docker/dockerfile:1
# One image for every Tollgate process: the control plane, a data-plane node and the CLI; the command
# chooses (see compose.yaml and kubernetes.yaml).
#
# Node 20, and only 20: the uWebSockets.js build Tollgate uses (@trufflesuite/uws-js-unofficial
# 20.30.0) ships native binaries for Node 18 and 20 built against glibc <= 2.36 (Debian bookworm). On
# another Node major it falls back to a slow pure-JS shim, and a node refuses to start.

# --- build: install production dependencies; sqlite3 is compiled here if no prebuilt binary fits ---
FROM node:20-bookworm-slim AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 make g++ ca-certificates \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY package.json package-lock.json ./
# allowScripts in package.json lets exactly sqlite3, esbuild and @bufbuild/buf run install scripts.
RUN npm ci --omit=dev && npm cache clean --force
COPY . .

# --- runtime: no compiler, no npm cache, not root ---
FROM node:20-bookworm-slim
ENV NODE_ENV=production
WORKDIR /app
COPY --from=build --chown=root:root /app /app
RUN mkdir -p /var/lib/tollgate && chown node:node /var/lib/tollgate
USER node
VOLUME ["/var/lib/tollgate"]
# 8080 API (nodes), 9090 admin (/healthz, /readyz), 50051 control plane gRPC.
EXPOSE 8080 9090 50051
# tsx runs the TypeScript sources in-process, so signals reach the program itself.
ENTRYPOINT ["node", "--import", "tsx"]
CMD ["control-plane/main.ts", "--db", "/var/lib/tollgate/tollgate.db", "--listen", "0.0.0.0:50051"]
