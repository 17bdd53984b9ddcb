# perfd agent / aggregator image. GPU access comes from the NVIDIA container toolkit
# (`--gpus all` / the device plugin), which injects libnvidia-ml; the image carries no driver.
# nsys, when wanted for captures, is mounted from the host (PERFD_NSYS=/path/to/nsys).
FROM python:3.12-slim

# Run as an unprivileged user; the agent only reads NVML, /proc and log files.
RUN useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin perfd

WORKDIR /opt/perfd
COPY pyproject.toml README.md ./
COPY perfd ./perfd
COPY collectors ./collectors
COPY rules ./rules
RUN pip install --no-cache-dir . && rm -rf /root/.cache

USER 10001
# 9400: agent /metrics; 9401: aggregator /metrics + JSON API; 50051: aggregator gRPC ingest
EXPOSE 9400 9401 50051
ENTRYPOINT ["perfd"]
CMD ["agent", "--metrics-port", "9400"]
