print("frontdesk-sender: not yet")
