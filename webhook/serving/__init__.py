"""HTTP: the Flask app, the gunicorn server, TLS certificates, metrics and logs."""
