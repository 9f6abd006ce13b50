"""cost_model"""
