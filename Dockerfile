# Conventional multi-stage build: a static binary on a minimal, non-root image.
# No Docker engine runs on the development machines, so this file is kept
# simple and is not exercised by CI.
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
ARG COMMIT=unknown
RUN CGO_ENABLED=0 go build -trimpath \
      -ldflags "-s -w -X main.version=${VERSION} -X main.commit=${COMMIT}" \
      -o /out/console ./cmd/console

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/console /usr/local/bin/console
USER nonroot:nonroot
EXPOSE 8080 8081
ENTRYPOINT ["/usr/local/bin/console"]
CMD ["serve"]
