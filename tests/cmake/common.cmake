# common/ base tests are registered by the areas that own them (config, rpc codec ...).
