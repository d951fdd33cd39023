# Production image: one image, four roles (web, ws, worker, beat) picked by the command.
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 FAULTLINE_DATA_DIR=/data
WORKDIR /app
COPY pyproject.toml README.md ./
COPY faultline faultline
COPY console console
COPY ingest ingest
COPY agents agents
COPY templates templates
COPY static static
COPY manage.py ./
RUN pip install --no-cache-dir . && useradd --system --home /data faultline \
    && mkdir -p /data && chown faultline /data
USER faultline
EXPOSE 8000 8001
CMD ["gunicorn", "faultline.wsgi:application", "--bind", "0.0.0.0:8000", "--workers", "2", \
     "--worker-class", "gthread", "--threads", "4", "--keep-alive", "30", \
     "--worker-connections", "4000", "--reuse-port", "--forwarded-allow-ips="]
