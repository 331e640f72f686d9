"""Research: honest cross-validated evaluation, metrics, the behaviour analysis and the HTML report."""
