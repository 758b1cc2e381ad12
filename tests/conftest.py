"""Real ZooKeeper and RabbitMQ servers for the suite come from latchwork's own harness."""

pytest_plugins = ["runner.testing.plugin"]
