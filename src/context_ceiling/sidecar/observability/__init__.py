"""What the sidecar reports: the recorder that turns an exchange into headers, a log line, metrics and a span; the metric families, traces, staleness, answer signals and costs."""
