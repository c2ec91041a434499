# Stand-in for registry.k8s.io/kubectl (the chart's pre-delete hook, examples.cleanupImage) where no registry
# can be reached: the kubectl that `make envtest` built for the test control plane's release, alone.
FROM scratch
COPY kubectl /bin/kubectl
ENV PATH=/bin
USER 65532:65532
ENTRYPOINT ["/bin/kubectl"]
