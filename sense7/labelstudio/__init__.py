"""Label Studio adapters: the API client, the server's lifecycle, the protocol (task data, annotations,
webhooks, ML-backend registration), batch import, and the raters' attribution accounts and task queues."""
