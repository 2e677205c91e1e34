"""One thin route file per resource: studies, trials, events (server-sent), artifacts, control (start and stop
searches), health, and the dashboard page."""
