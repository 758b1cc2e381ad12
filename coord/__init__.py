"""ZooKeeper recipes for latchwork: session, membership, leader latch, task locks, slots."""
