"""What a lean install of recovery-ext must not pull in: checked against the declared requirements
(tests/unit/test_packaging.py) and against pip's own resolve in a fresh venv (tests/process/test_lean_install.py)."""

HEAVY = {"openai", "httpx", "rapidocr-onnxruntime", "onnxruntime", "opencv-python", "pypdfium2", "pillow",
         "dagster-webserver", "dagster-graphql", "dagster-postgres", "azure-ai-documentintelligence", "azure-core"}
# The libraries whose errors the classifier's families read: the tests drive them, the library never imports
# them. grpcio, requests and urllib3 are not listed: Dagster itself depends on them.
CLASSIFIED_LIBRARIES = {"botocore", "boto3", "google-api-core", "google-genai", "anthropic", "mistralai", "cohere",
                        "litellm", "aiohttp", "websockets", "redis", "pymysql", "mysqlclient", "asyncpg", "kombu",
                        "amqp", "celery"}
