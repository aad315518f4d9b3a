"""optim"""
