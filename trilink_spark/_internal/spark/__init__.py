"""The Spark glue: classic/Connect compatibility, the session, reading physical plans."""
