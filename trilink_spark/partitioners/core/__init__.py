"""The strategies' ground: keys and their null rule, Spark's and Kafka's hashes, the
strategy base and its persistence, balance metrics, and the stateless strategies (hash,
modulo, block)."""
