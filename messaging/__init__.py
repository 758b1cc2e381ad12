"""RabbitMQ paradigms for latchwork: MASTER (unicast, master only), MODEL (fanout), API."""
