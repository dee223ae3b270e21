# The Kubernetes agent-sandbox pod image: plimsoll's TLS terminator in front of sandboxd.
#
#   cargo xtask dist      # static (musl) plimsoll-sandboxd-tls and plimsoll-sandboxd in target/dist/
#   docker build -f docker/agentsandbox.Dockerfile \
#     --build-arg BASE_IMAGE=node:22-bookworm-slim \
#     -t REGISTRY/plimsoll/agentsandbox:v0.26.0 target/dist
#
# The build context is target/dist (only the two binaries). BASE_IMAGE is yours to choose;
# it needs /bin/sh for project steps and node for JavaScript payloads (sandboxd proves
# which languages it has when it starts).
#
# The terminator is the entrypoint, as the SandboxTemplate's `command` must also say: it
# serves TLS 1.3 on 9090 with the Secret mounted at /etc/plimsoll/sandboxd-tls, starts
# sandboxd with the flags it is given (which must include --listen-host=127.0.0.1 and
# --grpc-port=9091, so sandboxd is never reachable from the pod network), and exits when
# sandboxd exits. k8s/sandboxtemplate.yaml states command and flags explicitly, because
# plimsolld's startup read-back cannot see an image's entrypoint.
ARG BASE_IMAGE=node:22-bookworm-slim
FROM ${BASE_IMAGE}
COPY plimsoll-sandboxd-tls /usr/local/bin/plimsoll-sandboxd-tls
COPY plimsoll-sandboxd /usr/local/bin/plimsoll-sandboxd
RUN chmod 0755 /usr/local/bin/plimsoll-sandboxd-tls /usr/local/bin/plimsoll-sandboxd \
 && /usr/local/bin/plimsoll-sandboxd-tls --version \
 && /usr/local/bin/plimsoll-sandboxd --version \
 && mkdir -p /workspace /etc/plimsoll/sandboxd-tls /etc/plimsoll/sandboxd-token
ENV LANG=C.UTF-8
# The terminator and sandboxd run as uid 0 (the template drops every capability but the six
# sandboxd needs); the code runs as 65532 (--run-as), so it can read neither the Secrets nor
# their memory. docs/agent-sandbox.md, "Who can read what inside a pod".
USER 0:0
WORKDIR /workspace
EXPOSE 9090
LABEL io.plimsoll.image="agentsandbox"
ENTRYPOINT ["/usr/local/bin/plimsoll-sandboxd-tls"]
CMD ["--listen-host=127.0.0.1", "--grpc-port=9091", "--token-file=/etc/plimsoll/sandboxd-token/token", "--root-dir=/workspace", "--run-as=65532:65532"]
