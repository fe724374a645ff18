# pdserve: one static binary for every role (router, prefill, decode, serve).
#   docker build -t pdserve .
#   docker run --rm -p 8000:8000 pdserve up --host 0.0.0.0
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/pdserve ./cmd/pdserve

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/pdserve /usr/local/bin/pdserve
# Router 8000; prefill 30000 (+ KV 8998); decode 30001.
EXPOSE 8000 30000 30001 8998
USER nonroot
ENTRYPOINT ["/usr/local/bin/pdserve"]
CMD ["up", "--host", "0.0.0.0"]
