# The released image: goreleaser (.goreleaser.yaml, dockers_v2) builds it
# for each platform from the binary it released, which it puts at
# <os>/<arch>/dispatcher in the build context, with the licence files.
# No compiler: the image holds exactly the released binary.
FROM gcr.io/distroless/static-debian12:nonroot
ARG TARGETPLATFORM
COPY ${TARGETPLATFORM}/dispatcher /dispatcher
COPY LICENSE NOTICE build/THIRD_PARTY_LICENSES /usr/share/doc/dispatcher/
# Run: no shell, no package manager, uid 65532.
USER nonroot:nonroot
ENTRYPOINT ["/dispatcher"]
