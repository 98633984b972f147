"""HunyuanVideo 1.5 (T2V and I2V): model, flavors, weights conversion, parallel plan."""
