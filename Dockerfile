# Build: a static binary of ./cmd/dispatcher.
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/dispatcher ./cmd/dispatcher

# Run: no shell, no package manager, uid 65532.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/dispatcher /dispatcher
USER nonroot:nonroot
ENTRYPOINT ["/dispatcher"]
