"""Label Studio adapters: the API client, the server's lifecycle, the protocol (task data, annotations,
webhooks, ML-backend registration), batch import and the simulated annotators of the demo."""
