# The ticketflow services (gateway, worker, feature jobs); Triton runs from NVIDIA's image.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY schemas schemas
COPY streams streams
COPY agents agents
COPY inference_gateway inference_gateway
COPY feature_jobs feature_jobs
COPY ingest ingest
COPY ticketflow ticketflow
# the CLI mounts `ticketflow eval` and `ticketflow model build` from these two
COPY evaluation evaluation
COPY training training
# the CLI mounts `ticketflow bench` and `ticketflow chaos` from these two
COPY benchmarks benchmarks
COPY chaos chaos
RUN pip install --no-cache-dir .
ENV TICKETFLOW_STATE_DIR=/var/lib/ticketflow
CMD ["ticketflow", "--help"]
