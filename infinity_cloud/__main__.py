from infinity_cloud.cli import main

main()
