"""The SearchTool group: the cluster's one search client, and the tool the agent loops call it through."""
