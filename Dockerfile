# The Kubemoot image, the one image every manifest in deploy/ names
# (ghcr.io/kubemoot/kubemoot:0.1.0): the operator runs `kubemoot operator` (the default
# command), each Agent's Deployment `kubemoot agent`, the dashboard and the gateway
# `kubemoot dashboard` / `kubemoot gateway`, and the dev overlay's emulated GPUs
# `kubemoot emulate-ollama`. Build it from the repository root:
#   docker build -t ghcr.io/kubemoot/kubemoot:0.1.0 .
# On kind, load it into the cluster's nodes instead of pushing it:
#   kind load docker-image ghcr.io/kubemoot/kubemoot:0.1.0
FROM python:3.11-slim
ENV PIP_NO_CACHE_DIR=1 PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
COPY pyproject.toml README.md /src/
COPY src /src/src
RUN pip install /src && rm -rf /src
USER 65532:65532
ENTRYPOINT ["kubemoot"]
CMD ["operator", "--all-namespaces"]
