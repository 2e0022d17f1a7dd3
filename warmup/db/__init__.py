"""The service's database: `models` (the tables), `engine`, `migrate`, `queue` (one class owns every queue
operation), `repository` (reads), `records` (the values they exchange), `manifests`, `retention`, `tokens`,
`outage`, `columns`."""
