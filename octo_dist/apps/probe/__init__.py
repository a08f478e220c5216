"""The probe job's on-node side: what the node and the image are (``facts``), written as a report (``write``)."""
