# Two images from one file:
#   docker build --target api    -t privtrain-api .     (no torch: the API only prices and admits)
#   docker build --target worker -t privtrain-worker .  (torch with CUDA, safetensors)
FROM python:3.11-slim AS base
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /srv/privtrain
COPY pyproject.toml README.md constraints.txt alembic.ini ./
COPY kernel ./kernel
COPY api ./api
COPY admin ./admin
COPY algorithms ./algorithms
COPY dp ./dp
COPY training ./training
COPY worker ./worker
COPY migrations ./migrations
COPY common ./common
COPY client ./client
RUN useradd --uid 10001 --create-home privtrain && mkdir -p /data && chown privtrain /data
ENV PRIVTRAIN_DATA_DIR=/data

FROM base AS api
RUN pip install -c constraints.txt ./common "./client[yaml]" .
USER privtrain
EXPOSE 8000
CMD ["uvicorn", "api.main:create_app", "--factory", "--host", "0.0.0.0", "--port", "8000", "--proxy-headers"]

FROM base AS worker
# The default index's Linux wheel of torch carries CUDA; pin the same version as development.
RUN pip install "torch==2.13.0" && pip install -c constraints.txt "./common[model,hf]" "./client[yaml]" ".[worker]"
USER privtrain
CMD ["privtrain-admin", "worker"]
