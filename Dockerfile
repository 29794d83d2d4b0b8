# The ticketflow services (gateway, worker, feature jobs); Triton runs from NVIDIA's image.
FROM python:3.11-slim
WORKDIR /app
# the runtime's locked dependencies first, so a code change reuses this layer
COPY requirements/runtime.txt requirements/build.txt requirements/
RUN pip install --no-cache-dir --require-hashes -r requirements/build.txt \
 && pip install --no-cache-dir --require-hashes -r requirements/runtime.txt
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
# `ticketflow stack` and the demo's processes
COPY devstack devstack
RUN pip install --no-cache-dir --no-deps --no-build-isolation .
ENV TICKETFLOW_STATE_DIR=/var/lib/ticketflow
CMD ["ticketflow", "--help"]
