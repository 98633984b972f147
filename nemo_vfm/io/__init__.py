"""Reading and writing videos and images."""
