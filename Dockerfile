FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY appliance ./appliance
COPY templates ./templates
COPY static ./static
RUN pip install --no-cache-dir -e .
VOLUME /data
EXPOSE 7777
# Listen on all interfaces inside the container; publish the port deliberately.
ENTRYPOINT ["appliance", "serve", "--data-dir", "/data", "--host", "0.0.0.0"]
