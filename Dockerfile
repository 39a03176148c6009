# The Polar image every compose service runs (API, proxy, stage workers, Flower, reference engine).
FROM python:3.11-slim
WORKDIR /app
COPY setup.cfg pyproject.toml README.md alembic.ini ./
COPY polar ./polar
COPY web ./web
COPY workers ./workers
COPY migrations ./migrations
RUN pip install --no-cache-dir -e . && useradd --create-home polar && mkdir -p /var/lib/polar && chown polar /var/lib/polar
USER polar
ENV PYTHONUNBUFFERED=1 POLAR_WORK_ROOT=/var/lib/polar/sessions POLAR_STATE_DIR=/var/lib/polar
