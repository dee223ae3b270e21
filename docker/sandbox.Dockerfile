# The Docker provider's sandbox image. Built by `cargo xtask images`, never pulled:
#   BASE is a Debian root filesystem made with debootstrap (sh, python3, nodejs) and loaded
#   with `docker import`; the build context holds only the static plimsoll-sandboxd.
#
# The image sets no ENTRYPOINT, no VOLUME and no environment that chooses what a program
# loads: plimsolld names sandboxd as the entrypoint of every container it creates, runs it
# as uid 61000 with a read-only root, and checks the image's ENV and VOLUME at startup.
ARG BASE
FROM ${BASE}
COPY plimsoll-sandboxd /usr/local/bin/plimsoll-sandboxd
RUN chmod 0755 /usr/local/bin/plimsoll-sandboxd \
 && /usr/local/bin/plimsoll-sandboxd --version \
 && mkdir -p /work /run/plimsoll \
 && chmod 1777 /work
ENV LANG=C.UTF-8
USER 61000:61000
WORKDIR /work
LABEL io.plimsoll.image="sandbox"
CMD ["/usr/local/bin/plimsoll-sandboxd", "--help"]
