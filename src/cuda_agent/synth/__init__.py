"""Data synthesis: mine seed operators, compose fused tasks, filter and de-contaminate them into a dataset."""
