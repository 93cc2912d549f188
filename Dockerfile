# specwatch's container image, for deploy/kubernetes (docs/kubernetes.md):
#   docker build -t specwatch:0.1.0 .
# The NVIDIA container runtime mounts the driver's libnvidia-ml and the GPU device nodes into
# it (NVIDIA_VISIBLE_DEVICES, NVIDIA_DRIVER_CAPABILITIES): the image carries no CUDA.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY specwatch ./specwatch
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:3.11-slim
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels \
    && groupadd --system --gid 65532 specwatch \
    && useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin specwatch
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=utility
# The uid the DaemonSet runs as (runAsUser), numeric so that runAsNonRoot can check it.
USER 65532:65532
EXPOSE 9849
ENTRYPOINT ["specwatch"]
CMD ["run", "--config", "/etc/specwatch/config.yaml"]
