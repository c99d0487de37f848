"""Model proxies and what they decide with: modes, efficiency, episodes, the safe
set, policies and their installation."""
