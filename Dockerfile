# Image built from source: docker build -t dispatcher .
# (Released images are built by goreleaser from the released binaries:
# release.Dockerfile.) A source build is a development build: dispatcher
# --version says devel, with the commit if given:
#   docker build --build-arg COMMIT="$(git rev-parse HEAD)" -t dispatcher .
FROM golang:1.26-bookworm AS build
WORKDIR /src
# The producer library shard/ is a module of its own, required by the
# root module through a replace: both go.mod files before the download.
COPY go.mod go.sum ./
COPY shard/go.mod shard/go.sum ./shard/
RUN go mod download
COPY . .
ARG VERSION=""
ARG COMMIT=""
ARG DATE=""
RUN CGO_ENABLED=0 go build -trimpath \
	-ldflags="-s -w -X main.buildVersion=${VERSION} -X main.buildCommit=${COMMIT} -X main.buildDate=${DATE}" \
	-o /out/dispatcher ./cmd/dispatcher \
	&& scripts/third-party-licenses.sh /out/THIRD_PARTY_LICENSES

# Run: no shell, no package manager, uid 65532.
FROM gcr.io/distroless/static-debian12:nonroot
LABEL org.opencontainers.image.title="dispatcher" \
	org.opencontainers.image.description="Moves delayed tasks from sharded Redis sorted sets to RabbitMQ at their due time" \
	org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /out/dispatcher /dispatcher
COPY --from=build /src/LICENSE /src/NOTICE /out/THIRD_PARTY_LICENSES /usr/share/doc/dispatcher/
USER nonroot:nonroot
ENTRYPOINT ["/dispatcher"]
