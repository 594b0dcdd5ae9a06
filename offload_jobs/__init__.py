"""PySpark jobs that move data already in Kafka into tierproxy's object layout."""
