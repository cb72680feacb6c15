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
ENV TAME_DATABASE_URL=sqlite:////data/tame.sqlite3
VOLUME ["/data"]
EXPOSE 8080
USER nobody
CMD ["tame", "serve", "--host", "0.0.0.0", "--port", "8080"]
