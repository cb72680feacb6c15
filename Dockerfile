# One image for the API (`tame serve`) and the agent (`tame agent`): Python 3.11 with iperf3.
FROM python:3.11-slim-bookworm
RUN apt-get update \
    && apt-get install -y --no-install-recommends iperf3 libiperf0 \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml ./
COPY models ./models
COPY probes ./probes
COPY advisor ./advisor
COPY api ./api
RUN pip install --no-cache-dir .
# A user of its own, not root and not nobody (whose files any other nobody process could touch), owning
# /data before VOLUME declares it, so a new volume starts out owned by that user and the store can be written.
RUN useradd --system --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin tame \
    && mkdir -p /data && chown tame:tame /data
ENV TAME_DATABASE_URL=sqlite:////data/tame.sqlite3
VOLUME ["/data"]
EXPOSE 8080
USER tame
CMD ["tame", "serve", "--host", "0.0.0.0", "--port", "8080"]
