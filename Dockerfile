# The latchwork node image used by docker-compose.yml.
FROM python:3.11-slim-bookworm

# PySpark needs a JVM; Debian 12's default is OpenJDK 17.
RUN apt-get update \
 && apt-get install -y --no-install-recommends default-jre-headless procps \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/latchwork
COPY pyproject.toml README.md ./
COPY coord ./coord
COPY messaging ./messaging
COPY runner ./runner
RUN pip install --no-cache-dir ".[pipeline]"

RUN useradd --create-home latchwork && mkdir /data && chown latchwork /data
USER latchwork
WORKDIR /home/latchwork

# SIGTERM ends a node cleanly (running tasks cancelled and recorded, locks released).
STOPSIGNAL SIGTERM
CMD ["latchwork", "node", "start"]
