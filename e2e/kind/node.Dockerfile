# The kind node image of scripts/kind.sh, built without any registry: kind's own base image
# (sigs.k8s.io/kind images/base, whose files/ scripts/kind.sh copies into the context) remade on the
# project's Debian bookworm base, with containerd, runc and the CNI plugins from Debian instead of kind's
# builds, kubelet/kubeadm/kubectl of the project's Kubernetes release (scripts/envtest.sh), and the images
# kubeadm runs preloaded (files/kind/images/images.tar, imported at boot by kind-preload-images.service).
ARG BASE=fleetmq.local/debian:bookworm
FROM $BASE
# kind's package list, less what only rootless, NFS or iSCSI need; systemd-sysctl masked and the sysctl.d
# files removed: the container is privileged, /proc/sys is the host's and must stay as it is
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      systemd systemd-sysv dbus containerd runc containernetworking-plugins \
      conntrack iptables nftables iproute2 ethtool util-linux mount kmod libseccomp2 \
      bash ca-certificates curl jq procps socat ebtables \
    && rm -rf /var/lib/apt/lists/* \
    && find /lib/systemd/system/sysinit.target.wants/ -name "systemd-tmpfiles-setup.service" -delete \
    && rm -f /lib/systemd/system/multi-user.target.wants/* /etc/systemd/system/*.wants/* \
      /lib/systemd/system/local-fs.target.wants/* /lib/systemd/system/sockets.target.wants/*udev* \
      /lib/systemd/system/sockets.target.wants/*initctl* /lib/systemd/system/basic.target.wants/* \
    && echo "ReadKMsg=no" >>/etc/systemd/journald.conf
COPY files/ /
COPY bin/ /usr/bin/
RUN chmod 755 /usr/local/bin/* /kind/bin/* /usr/bin/kubelet /usr/bin/kubeadm /usr/bin/kubectl \
    && rm -rf /usr/lib/sysctl.d/* /etc/sysctl.d/* /etc/sysctl.conf \
    && mkdir -p /opt/cni/bin /etc/kubernetes/manifests && ln -s /usr/lib/cni/* /opt/cni/bin/ \
    && ctr oci spec \
      | jq '.hooks.createContainer[.hooks.createContainer | length] |= . + {"path": "/kind/bin/mount-product-files.sh"}' \
      | jq 'del(.process.rlimits)' >/etc/containerd/cri-base.json \
    && systemctl enable kubelet.service containerd.service undo-mount-hacks.service kind-preload-images.service \
    && systemctl mask systemd-binfmt.service systemd-sysctl.service
ENV container=docker
STOPSIGNAL SIGRTMIN+3
ENTRYPOINT ["/usr/local/bin/entrypoint", "/kind/bin/mask-sysctls", "/sbin/init"]
