# perfd agent / aggregator image. GPU access comes from the NVIDIA container toolkit
# (`--gpus all`, or the NVIDIA runtime with NVIDIA_VISIBLE_DEVICES=all as in deploy/k8s), which
# injects libnvidia-ml; the image carries no driver.
# nsys, for captures, is mounted from the host when present: -v /opt/nvidia/nsight-systems/VER:/opt/nsys:ro
# -e PERFD_NSYS=/opt/nsys/bin/nsys (deploy/k8s/agent-daemonset.yaml does the same with a hostPath).
#
#   docker build -t perfd:0.2.0 .                          # agent + aggregator
#   docker build --build-arg WITH_WANDB=1 -t perfd:0.2.0 .   # + Weights & Biases export
FROM python:3.12-slim

ARG WITH_WANDB=""
# No .pyc writes (the root filesystem may be read-only) and unbuffered logs.
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1

# Run as an unprivileged user; the agent only reads NVML, /proc and log files.
RUN useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin perfd

WORKDIR /opt/perfd
COPY pyproject.toml README.md ./
COPY perfd ./perfd
COPY rules ./rules
# nats-py and ddsketch (pure Python, ~0.2 MB; perfd[engine]'s pins): a job larger than one aggregator
# (perfd shard, --engine);
# cramjam (perfd[remote-write]'s snappy): the aggregator's --remote-write (the chart's aggregator.remoteWrite)
RUN pip install --no-cache-dir . "nats-py==2.16.0" "ddsketch==3.0.1" "cramjam==2.14.0" \
    && if [ -n "$WITH_WANDB" ]; then pip install --no-cache-dir "wandb==0.31.0"; fi \
    && rm -rf /root/.cache

USER 10001
# 14400: agent /metrics (not 9400: dcgm-exporter's); 9401: aggregator /metrics + JSON API;
# 50051: aggregator gRPC ingest
EXPOSE 14400 9401 50051
ENTRYPOINT ["perfd"]
# --listen-all: inside a container, loopback is unreachable from the host and from Prometheus.
CMD ["agent", "--metrics-port", "14400", "--listen-all"]
