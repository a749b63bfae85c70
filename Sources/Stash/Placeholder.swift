import StashLMDB
